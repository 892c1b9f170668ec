"""Feedback at every edit: the syntax veto on fs_write, fs_edit and fs_apply_patch, and the
linter's new findings in the tool result (a real linter command through the sandbox)."""

from __future__ import annotations

import shutil
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from coder.config import as_config
from coder.policy.commands import Policy
from coder.redact import Redactor
from coder.taskfile.policies import Policies
from coder.tools.base import ToolContext, ToolResult
from coder.tools.registry import default_registry

CALC = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"

# A linter of our own: flags every `print(` as P001 and every TODO as T001.
LINTER = textwrap.dedent(
    """\
    import sys
    path = sys.argv[1]
    for number, line in enumerate(open(path, encoding="utf-8"), 1):
        if "print(" in line:
            print(f"{path}:{number}:{line.index('print(') + 1}: P001 print found")
        if "TODO" in line:
            print(f"{path}:{number}:1: T001 a TODO is left")
    """
)


@pytest.fixture
def ctx(make_repo) -> ToolContext:
    root = make_repo({"calc.py": CALC, "lint.py": LINTER, "notes.md": "# notes\n"})
    return ToolContext(
        root=root, policy=Policy(), redactor=Redactor(), policies=Policies(lint_after_edit=False)
    )


def call(ctx: ToolContext, name: str, **args: Any) -> ToolResult:
    return default_registry().call(name, args, ctx)


def test_an_edit_that_breaks_the_syntax_is_refused_and_the_file_kept(ctx: ToolContext) -> None:
    result = call(
        ctx, "fs_edit", path="calc.py", search="    return a + b\n", replace="    return (a + b\n"
    )
    assert not result.ok
    assert (ctx.root / "calc.py").read_text() == CALC
    assert result.content.startswith(
        "edit refused: it would leave a syntax error in calc.py at line 2"
    )
    assert "calc.py was not changed" in result.content
    assert (
        "    2|     return (a + b\n" in result.content
        and "^ '(' was never closed" in result.content
    )
    assert result.data["syntax_error"] == {
        "path": "calc.py",
        "line": 2,
        "message": "'(' was never closed",
    }
    assert "parses" in (result.hint or "")


def test_fs_write_refuses_a_new_file_that_does_not_parse(ctx: ToolContext) -> None:
    result = call(ctx, "fs_write", path="src/new.go", content="package x\nfunc f() {\n")
    assert not result.ok and "syntax error in src/new.go" in result.content
    assert not (ctx.root / "src").exists()
    assert call(ctx, "fs_write", path="notes2.md", content="((( not code\n").ok  # no grammar


def test_a_patch_that_breaks_one_file_changes_none(ctx: ToolContext) -> None:
    patch = textwrap.dedent(
        """\
        --- /dev/null
        +++ b/ok.py
        @@ -0,0 +1 @@
        +X = 1
        --- a/notes.md
        +++ b/notes.md
        @@ -1 +1 @@
        -# notes
        +# more notes
        --- a/calc.py
        +++ b/calc.py
        @@ -4,3 +4,3 @@


        -def sub(a, b):
        +def sub(a, b:
             return a - b
        """
    )
    result = call(ctx, "fs_apply_patch", patch=patch)
    assert not result.ok and "syntax error in calc.py at line 5" in result.content
    assert (ctx.root / "calc.py").read_text() == CALC
    assert (ctx.root / "notes.md").read_text() == "# notes\n"
    assert not (ctx.root / "ok.py").exists()


def test_a_file_that_was_broken_before_can_still_be_edited(ctx: ToolContext) -> None:
    (ctx.root / "broken.py").write_text("def f(:\n    pass\nx = 1\n")
    assert call(ctx, "fs_edit", path="broken.py", search="x = 1", replace="x = 2").ok


def test_the_veto_can_be_turned_off(ctx: ToolContext) -> None:
    off = replace(ctx, policies=Policies(veto_syntax_errors=False, lint_after_edit=False))
    assert call(off, "fs_edit", path="calc.py", search="a + b", replace="(a + b").ok


def linted(ctx: ToolContext) -> ToolContext:
    command = f"{Path(sys.executable).name} lint.py {{file}}"
    return replace(ctx, policies=Policies(), config=as_config({"lint_command": command}))


def test_new_lint_findings_come_back_with_the_edit(ctx: ToolContext) -> None:
    ctx = linted(ctx)
    (ctx.root / "calc.py").write_text(CALC + "\nprint('old')\n")
    result = call(
        ctx,
        "fs_edit",
        path="calc.py",
        search="    return a - b\n",
        replace="    print(a)  # TODO\n    return a - b\n",
    )
    assert result.ok, result.content
    lint = result.content.split("\nlint: ", 1)[1]
    assert lint.startswith("2 new findings")
    assert "calc.py:6:5: P001 print found\n      6|     print(a)  # TODO" in lint
    assert "calc.py:6:1: T001 a TODO is left" in lint
    assert "print('old')" not in lint  # it was there before: not new
    clean = call(ctx, "fs_edit", path="calc.py", search="a + b", replace="b + a")
    assert clean.ok and "lint:" not in clean.content
    created = call(ctx, "fs_write", path="new.py", content="print(1)\n")
    assert "new.py:1:1: P001 print found" in created.content


def test_a_linter_the_policy_refuses_is_reported_once_and_not_run(ctx: ToolContext) -> None:
    command = "curl -s http://127.0.0.1/ {file}"
    ctx = replace(ctx, policies=Policies(), config=as_config({"lint_command": command}))
    first = call(ctx, "fs_edit", path="calc.py", search="a + b", replace="b + a")
    assert first.ok and "lint: lint_command was not run: " in first.content
    second = call(ctx, "fs_edit", path="calc.py", search="a - b", replace="b - a")
    assert second.ok and "lint:" not in second.content


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed")
def test_ruff_is_detected_and_run_on_the_edited_file(make_repo) -> None:
    root = make_repo({"pyproject.toml": "[tool.ruff]\n", "calc.py": CALC})
    ctx = ToolContext(root=root, policy=Policy(), redactor=Redactor())
    result = call(
        ctx,
        "fs_edit",
        path="calc.py",
        search="    return a - b\n",
        replace="    return a - undefined_name\n",
    )
    assert result.ok and "F821 Undefined name `undefined_name`" in result.content


def test_code_search_finds_a_function_by_its_docstring(make_repo) -> None:
    root = make_repo(
        {
            "geo.py": 'def haversine(a, b):\n    """Great-circle distance between two points on a sphere."""\n    return 0\n',
            "calc.py": CALC,
        }
    )
    ctx = ToolContext(root=root, policy=Policy(), redactor=Redactor())
    result = call(ctx, "code_search", query="distance between two points")
    assert result.ok
    assert result.content.startswith("geo.py:1-3 (haversine)\n    1| def haversine(a, b):\n    2|")
    assert result.data["results"][0] == {
        "path": "geo.py",
        "start": 1,
        "end": 3,
        "name": "haversine",
    }
    assert not call(ctx, "code_search", query="   ").ok
    nothing = call(ctx, "code_search", query="quantum chromodynamics")
    assert nothing.ok and nothing.content.startswith("no code matches")
    only = call(ctx, "code_search", query="add sub haversine", glob="calc.py")
    assert {r["path"] for r in only.data["results"]} == {"calc.py"}
