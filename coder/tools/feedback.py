"""What the model learns the moment it edits a file, instead of when the tests run.

* The syntax veto (`veto`): an edit after which the file no longer parses, when it parsed
  before (or is new), is refused; the file is left as it was and the error comes back with
  numbered lines around it. (SWE-agent measured this as a clear gain for weaker models.)
* The linter (`Lint`): the project's linter runs on the edited file alone, before and after the
  edit, and only the findings the edit introduced come back with the tool's result. The linter
  is a command like any other: it runs through the sandbox under the run's policy, and a
  linter the policy does not allow is reported once, not run.

The taskfile's `policies.veto_syntax_errors` and `policies.lint_after_edit` turn them off.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from coder.checks.lintreport import (
    Finding,
    Linter,
    linters_for,
    new_findings,
    parse_output,
    unread_failure,
)
from coder.context import syntax
from coder.errors import PolicyViolation
from coder.policy.sandbox import run_command
from coder.tools.base import ToolContext, ToolResult

LINT_TIMEOUT_S = 60
MAX_FINDINGS = 10  # shown per edit


def veto(ctx: ToolContext, rel: str, old: bytes | None, new: bytes) -> ToolResult | None:
    """The refusal of an edit that breaks `rel`'s syntax, or None to let it through."""
    if not ctx.policies.veto_syntax_errors:
        return None
    problem = syntax.check(rel, new)
    if problem is None or (old is not None and syntax.check(rel, old) is not None):
        return None
    text = new.decode("utf-8", errors="replace")
    return ToolResult.error(
        f"edit refused: it would leave a syntax error in {rel} at line {problem.line}, column "
        f"{problem.column} ({problem.message}); {rel} was not changed. The file would read:\n"
        + syntax.show(text, problem),
        hint="correct the edit so the file still parses (brackets, quotes, indentation, a "
        "missing line) and make it again",
        data={"syntax_error": {"path": rel, "line": problem.line, "message": problem.message}},
    )


@dataclass
class Lint:
    """One edit's lint: `before` with the files as they are, `after` once they changed."""

    ctx: ToolContext
    findings_before: dict[str, tuple[str, list[Finding]]] = field(default_factory=dict)

    def before(self, rels: Iterable[str]) -> None:
        if not self.ctx.policies.lint_after_edit:
            return
        for rel in rels:
            text = _read(self.ctx, rel)
            found = self._lint(rel, text) if text is not None else []
            self.findings_before[rel] = (text or "", found or [])

    def after(self, rels: Iterable[str]) -> str:
        """The new findings of the edited files (and notes on linters that could not run),
        as text to append to the tool's result; "" when there is nothing to say."""
        if not self.ctx.policies.lint_after_edit:
            return ""
        lines: list[str] = []
        fresh: list[Finding] = []
        for rel in rels:
            text = _read(self.ctx, rel)
            if text is None:
                continue
            found = self._lint(rel, text)
            if found is None:
                continue
            old_text, old = self.findings_before.get(rel, ("", []))
            fresh += new_findings(old, old_text, found, text)
        notes = self.ctx._edits.pop("notes", [])
        if fresh:
            lines.append(
                f"lint: {len(fresh)} new finding{'s' if len(fresh) > 1 else ''} "
                "(fix them now, or say why not in step_complete):"
            )
            for finding in fresh[:MAX_FINDINGS]:
                lines.append(f"  {finding}")
                source = _line(self.ctx, finding)
                if source is not None:
                    lines.append(f"  {finding.line:>5}| {source}")
            if len(fresh) > MAX_FINDINGS:
                lines.append(f"  ... and {len(fresh) - MAX_FINDINGS} more")
        lines += [f"lint: {note}" for note in notes]
        return "\n".join(lines)

    def _lint(self, rel: str, text: str) -> list[Finding] | None:
        """The findings of every linter for `rel` as it reads now (memoised by content);
        None when no linter checks it."""
        linters = linters_for(self.ctx.root, rel, self.ctx.config.lint_command)
        if not linters:
            return None
        digest = hashlib.sha256(text.encode("utf-8", errors="surrogateescape")).hexdigest()
        found: list[Finding] = []
        for linter in linters:
            key = (linter.name, rel, digest)
            if key not in self.ctx._edits:
                self.ctx._edits[key] = self._run(linter, rel)
            found += self.ctx._edits[key]
        return found

    def _run(self, linter: Linter, rel: str) -> list[Finding]:
        if linter.name in self.ctx._edits.setdefault("disabled", set()):
            return []
        try:
            result = run_command(
                linter.command_for(rel),
                cwd=self.ctx.root,
                policy=self.ctx.policy,
                timeout=min(LINT_TIMEOUT_S, self.ctx.command_timeout or LINT_TIMEOUT_S),
                cancel=self.ctx.cancel,
                root=self.ctx.root,
                owner=self.ctx.owner,
            )
        except PolicyViolation as exc:
            return self._disable(linter, f"{linter.name} was not run: {exc.message}")
        output = result.stdout + "\n" + result.stderr
        if result.timed_out:
            return self._disable(linter, f"{linter.name} timed out and was turned off")
        if unread := unread_failure(linter, rel, result.exit_code, output):
            return self._disable(linter, f"{unread}; it was turned off")
        return parse_output(output, linter, rel)

    def _disable(self, linter: Linter, note: str) -> list[Finding]:
        self.ctx._edits.setdefault("disabled", set()).add(linter.name)
        self.ctx._edits.setdefault("notes", []).append(note)
        return []


def _read(ctx: ToolContext, rel: str) -> str | None:
    try:
        return (ctx.root / rel).read_bytes().decode("utf-8", errors="surrogateescape")
    except OSError:
        return None


def _line(ctx: ToolContext, finding: Finding) -> str | None:
    text = _read(ctx, finding.path)
    lines = text.split("\n") if text is not None else []
    return lines[finding.line - 1].rstrip()[:200] if 0 < finding.line <= len(lines) else None
