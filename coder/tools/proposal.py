"""What a model's call would change, and the answer to it (per-edit approvals: the questions
themselves are coder.tools.approval's `gated`).

    FileChange, Proposal  what a call would do: files before and after (shown as a unified
                          diff), or a command with the policy's decision on it
    Verdict               the answer: yes; no, with a reason; edit; all
    Approver              who answers, `(proposal) -> Verdict` (a run's: coder.run.approvals)
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

Answer = Literal["yes", "no", "edit", "all"]


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
    arguments: Mapping[str, object] = field(default_factory=dict)

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
