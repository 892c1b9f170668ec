"""Per-edit approvals at the registry (coder.tools.approval): each change is shown before it
happens, exactly as it would be written, and the answer decides. Real files, a real git
repository, real commands; the approver is the only stand-in (the terminal's is tested in
tests/run/test_edit_approvals.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from coder.policy.commands import Policy
from coder.redact import Redactor
from coder.tools.base import ToolContext, ToolResult
from coder.tools.proposal import Proposal, Verdict
from coder.tools.registry import default_registry


class Asked:
    """An approver that answers from a list and remembers what it was shown."""

    def __init__(self, *answers: Verdict) -> None:
        self.answers = list(answers)
        self.shown: list[Proposal] = []

    def __call__(self, proposal: Proposal) -> Verdict:
        self.shown.append(proposal)
        return self.answers.pop(0)


@pytest.fixture
def root(make_repo) -> Path:
    root = make_repo({"notes.txt": "keep me\n", "gone.txt": "bye\n"})
    (root / "crlf.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")  # uncommitted, as edits are
    (root / "nonl.txt").write_bytes(b"a\nb")
    return root


def call(root: Path, approve: Asked, name: str, **args: Any) -> ToolResult:
    ctx = ToolContext(root=root, policy=Policy(), redactor=Redactor(), approve=approve)
    return default_registry().call(name, args, ctx)


def test_a_refused_edit_changes_nothing_and_the_model_gets_the_reason(root: Path) -> None:
    asked = Asked(Verdict("no", reason="use the helper in utils.py"))
    result = call(root, asked, "fs_edit", path="notes.txt", search="keep me", replace="gone")
    assert not result.ok
    assert "use the helper in utils.py" in result.as_text()
    assert (root / "notes.txt").read_text() == "keep me\n"
    (shown,) = asked.shown
    assert shown.diff() == (
        "diff --git a/notes.txt b/notes.txt\n--- a/notes.txt\n+++ b/notes.txt\n"
        "@@ -1 +1 @@\n-keep me\n+gone\n"
    )


def test_the_patch_shown_is_what_is_written(root: Path) -> None:
    """The preview works the patch out with libgit2, as the write does: CRLF line ends, a
    missing final newline, a new file and a deleted one."""
    patch = (
        "--- a/crlf.txt\n+++ b/crlf.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n"
        "--- a/nonl.txt\n+++ b/nonl.txt\n@@ -1,2 +1,2 @@\n-a\n+A\n b\n"
        "\\ No newline at end of file\n"
        "--- /dev/null\n+++ b/new/made.txt\n@@ -0,0 +1 @@\n+made\n"
        "--- a/gone.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n"
    )
    asked = Asked(Verdict("yes"))
    assert call(root, asked, "fs_apply_patch", patch=patch).ok
    (shown,) = asked.shown
    after = {f.path: f.after for f in shown.files}
    assert after == {
        "crlf.txt": b"one\r\nTWO\r\nthree\r\n",
        "nonl.txt": b"A\nb",
        "new/made.txt": b"made\n",
        "gone.txt": None,
    }
    assert (root / "crlf.txt").read_bytes() == after["crlf.txt"]
    assert (root / "nonl.txt").read_bytes() == after["nonl.txt"]
    assert (root / "new/made.txt").read_bytes() == b"made\n"
    assert not (root / "gone.txt").exists()
    # a dry run writes nothing: nobody is asked
    dry = Asked()
    assert call(root, dry, "fs_apply_patch", patch=patch, dry_run=True) is not None
    assert dry.shown == []


def test_a_call_that_would_fail_is_not_asked(root: Path) -> None:
    asked = Asked()
    result = call(root, asked, "fs_edit", path="notes.txt", search="absent", replace="x")
    assert not result.ok and "not found" in result.content
    assert call(root, asked, "fs_write", path="../outside.txt", content="x").ok is False
    assert call(root, asked, "shell_run", cmd="curl http://example.com").ok is False
    assert asked.shown == []


def test_the_users_edit_is_what_is_written(root: Path) -> None:
    asked = Asked(Verdict("edit", files={"made.txt": b"the user's\n"}))
    result = call(root, asked, "fs_write", path="made.txt", content="the model's\n")
    assert result.ok
    assert (root / "made.txt").read_bytes() == b"the user's\n"
    assert "-the model's" in result.content and "+the user's" in result.content


def test_a_command_is_shown_with_the_policys_decision_and_runs_as_edited(root: Path) -> None:
    asked = Asked(Verdict("edit", command="echo edited > out.txt"))
    result = call(root, asked, "shell_run", cmd="echo model > out.txt")
    (shown,) = asked.shown
    assert shown.command == "echo model > out.txt"
    assert shown.decision is not None and shown.decision.startswith("allowed: runs")
    assert "network off" in shown.decision
    assert result.ok and "the user changed the command to `echo edited > out.txt`" in result.content
    assert (root / "out.txt").read_text() == "edited\n"


def test_read_only_tools_are_never_asked(root: Path) -> None:
    asked = Asked()
    assert call(root, asked, "fs_read", path="notes.txt").ok
    assert call(root, asked, "git_status").ok
    assert asked.shown == []
