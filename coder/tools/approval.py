"""Per-edit approvals: each write, patch and command the model asks for is shown before it
happens, and the answer decides what happens (what a call would change and the answer's types
are coder.tools.proposal).

    gated                 how `Registry.call` runs a tool that is not read-only when
                          `ctx.approve` is set: after validation, in place of the handler

A tool's `preview(ctx, args)` works the change out as its handler would, up to the write. When
the call would fail anyway it answers the handler's own error (nobody is asked: nothing would
change); None means there is nothing to approve (a patch's dry run). A tool without a preview
(an MCP server's) is shown by its arguments.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from coder.files import nofollow
from coder.models.provider import Arguments
from coder.tools import feedback
from coder.tools.base import Tool, ToolContext, ToolResult
from coder.tools.proposal import Proposal, unified
from coder.tools.worktree import real_root, write_in_root

MAX_DIFF_LINES = 80  # of the user's edit, shown to the model


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
