"""Per-edit approvals: each write, patch and command the model asks for is shown before it
happens, and the answer decides what happens.

    FileChange, Proposal  what a call would do: files before and after (shown as a unified
                          diff), or a command with the policy's decision on it
    Verdict               the answer: yes; no, with a reason (the model gets it as the tool's
                          result, nothing is changed); edit (the user's content, or command,
                          instead of the model's); all (yes, and no more questions this step)
    Approver              who answers, `(proposal) -> Verdict` (a run's: coder.run.approvals)
    gated                 how `Registry.call` runs a tool that is not read-only when
                          `ctx.approve` is set: after validation, in place of the handler

A tool's `preview(ctx, args)` works the change out as its handler would, up to the write. When
the call would fail anyway it answers the handler's own error (nobody is asked: nothing would
change); None means there is nothing to approve (a patch's dry run). A tool without a preview
(an MCP server's) is shown by its arguments.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from coder.files import nofollow
from coder.models.provider import Arguments
from coder.tools import feedback
from coder.tools.base import Tool, ToolContext, ToolResult
from coder.tools.worktree import real_root, write_in_root

Answer = Literal["yes", "no", "edit", "all"]
MAX_DIFF_LINES = 80  # of the user's edit, shown to the model


@dataclass(frozen=True)
class FileChange:
    path: str  # repo-relative, resolved by the tool's own checks
    before: bytes | None  # None: the call creates the file
    after: bytes | None  # None: the call deletes it
    mode: int = 0o644


@dataclass(frozen=True)
class Proposal:
    tool: str
    files: tuple[FileChange, ...] = ()
    command: str | None = None  # a command tool's command line, as it would run
    decision: str | None = None  # the policy's decision on the command
    arguments: Arguments = field(default_factory=dict)

    @property
    def editable(self) -> bool:
        """Whether `edit` applies: a file it writes, or a command given in full (shell_run;
        tests_run's command is the configured one)."""
        if self.command is not None:
            return "cmd" in self.arguments
        return any(f.after is not None and b"\0" not in f.after for f in self.files)

    @property
    def target(self) -> str:
        """The files, the command or the arguments, in a few words (for the log)."""
        if self.command is not None:
            return self.command
        if self.files:
            return ", ".join(f.path for f in self.files)
        return json.dumps(self.arguments, sort_keys=True)[:300]

    def diff(self) -> str:
        """The files' change as a unified diff (`git diff`'s headers)."""
        return "".join(unified(f.path, f.before, f.after) for f in self.files)


@dataclass(frozen=True)
class Verdict:
    answer: Answer
    reason: str = ""  # no: why (goes to the model)
    files: Mapping[str, bytes] = field(default_factory=dict)  # edit: path -> what to write
    command: str | None = None  # edit: the command to run instead


Approver = Callable[[Proposal], Verdict]
Preview = Callable[[ToolContext, Arguments], "Proposal | ToolResult | None"]


def unified(path: str, before: bytes | None, after: bytes | None) -> str:
    """One file's unified diff, as git writes it (`/dev/null` for a side that is absent)."""
    old = "/dev/null" if before is None else f"a/{path}"
    new = "/dev/null" if after is None else f"b/{path}"
    head = f"diff --git a/{path} b/{path}\n"
    if b"\0" in (before or b"") or b"\0" in (after or b""):
        return f"{head}Binary files {old} and {new} differ\n"
    lines = difflib.unified_diff(_lines(before), _lines(after), old, new)
    body = "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )
    return head + body


def _lines(data: bytes | None) -> list[str]:
    if data is None:
        return []
    return data.decode("utf-8", errors="replace").splitlines(keepends=True)


def gated(tool: Tool, args: Arguments, ctx: ToolContext) -> ToolResult:
    """The call as the answer says: the handler (yes, all), the refusal with the user's
    reason (no), or the user's version written or run instead (edit)."""
    assert ctx.approve is not None
    # a tool without a preview (an MCP server's) is shown by its arguments
    proposal = tool.preview(ctx, args) if tool.preview else Proposal(tool.name, arguments=args)
    if isinstance(proposal, ToolResult):  # it would fail: the handler's own error
        return proposal
    if proposal is None:
        return tool.handler(ctx, args)
    verdict = ctx.approve(proposal)
    if ctx.cancel is not None and ctx.cancel.is_set():  # stopped while it asked (Ctrl-C)
        return ToolResult.error("the step is being stopped; the tool was not run")
    if verdict.answer in ("yes", "all"):
        return tool.handler(ctx, args)
    if verdict.answer == "no":
        done = "run" if proposal.command is not None else "changed"
        return ToolResult.error(
            f"the user refused this {tool.name} call; nothing was {done}. The user's reason: "
            + (verdict.reason.strip() or "(none given)"),
            hint="do what the user asks instead; do not make the same call again",
            data={"refused_by_user": True, "reason": verdict.reason},
        )
    if verdict.command is not None:
        result = tool.handler(ctx, {**args, "cmd": verdict.command})
        return dataclasses.replace(
            result,
            content=f"the user changed the command to `{verdict.command}` before it ran\n"
            + result.content,
            data={**result.data, "edited_by_user": True},
        )
    return _write_edited(ctx, proposal, verdict.files)


def _write_edited(ctx: ToolContext, proposal: Proposal, edited: Mapping[str, bytes]) -> ToolResult:
    """The proposal's files with the user's content where the user edited them (a deletion
    stays one). coder writes them, following no link (`write_in_root`); the syntax veto is
    the model's, not the user's, so it does not apply."""
    lint = feedback.Lint(ctx)
    lint.before(f.path for f in proposal.files if f.before is not None)
    written, differences = [], []
    for change in proposal.files:
        if change.after is None:
            nofollow.remove(real_root(ctx), change.path, prune=False)
            continue
        data = edited.get(change.path, change.after)
        write_in_root(ctx, change.path, data, mode=change.mode, new_only=change.before is None)
        written.append(change.path)
        if data != change.after:
            differences.append(unified(change.path, change.after, data))
    shown = "".join(differences).splitlines()
    if len(shown) > MAX_DIFF_LINES:
        shown = shown[:MAX_DIFF_LINES] + [f"... ({len(shown) - MAX_DIFF_LINES} more lines)"]
    notes = lint.after(written)
    text = (
        f"the user edited your change before it was written: {', '.join(written) or 'nothing'}"
        + (
            " written as the user changed it (your version on the - side, the user's on the "
            "+ side):\n" + "\n".join(shown)
            if shown
            else " written as you proposed"
        )
        + "\nRead the files again before you change them further."
        + (f"\n{notes}" if notes else "")
    )
    return ToolResult(True, text, data={"files_changed": written, "edited_by_user": True})
