"""File tools through the registry: fs_read, fs_write, fs_edit, fs_apply_patch, fs_glob,
fs_grep, and the path guard on each (traversal, absolute paths, symlinks, protected files)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from coder.policy.commands import Policy
from coder.policy.paths import PROTECTED as TABLE
from coder.redact import Redactor
from coder.tools import grep
from coder.tools.base import ToolContext, ToolResult
from coder.tools.registry import default_registry, doc_write_filter
from coder.tools.worktree import glob_regex

APP = "".join(f"line {i}\n" for i in range(1, 11))
CODE = """\
def add(a, b):
    return a + b


def sub(a, b):
    return a - b


def mul(a, b):
    return a * b
"""


@pytest.fixture
def ctx(make_repo, tmp_path: Path) -> ToolContext:
    root = make_repo(
        {
            "README.md": "# sample\n",
            "src/app.txt": APP,
            "src/calc.py": CODE,
            "src/pkg/deep.py": "X = 1\n",
        }
    )
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("outside data\n")
    os.symlink(outside / "secret.txt", root / "link_out.txt")
    os.symlink(outside, root / "dir_out")
    os.symlink("src/calc.py", root / "link_in.py")
    return ToolContext(root=root, policy=Policy(), redactor=Redactor())


def call(ctx: ToolContext, name: str, **args: Any) -> ToolResult:
    return default_registry().call(name, args, ctx)


def read(ctx: ToolContext, rel: str) -> str:
    return (ctx.root / rel).read_text()


# --------------------------------------------------------------------------- path guard

ESCAPES = [
    "../outside/secret.txt",
    "/etc/passwd",
    "link_out.txt",
    "dir_out/secret.txt",
    "src/../../outside/secret.txt",
]


@pytest.mark.parametrize("path", ESCAPES)
def test_reads_cannot_leave_the_worktree(ctx: ToolContext, path: str) -> None:
    result = call(ctx, "fs_read", path=path)
    assert not result.ok and "escapes the worktree" in result.content
    assert "outside data" not in result.as_text()
    assert "paths must stay inside the repository" in (result.hint or "")


PROTECTED = [
    ".git/config",
    ".git/hooks/pre-commit",
    ".coder/x",
    ".env",
    "config/.env.production",
    "key.pem",
    "deploy/id_rsa",
    "src/my_secret.py",
]


@pytest.mark.parametrize("path", [*ESCAPES, "dir_out/new.txt", *PROTECTED])
def test_writes_are_refused_outside_and_to_protected_paths(ctx: ToolContext, path: str) -> None:
    before = (ctx.root / ".git" / "config").read_bytes()
    for result in (
        call(ctx, "fs_write", path=path, content="x\n"),
        call(ctx, "fs_edit", path=path, search="a", replace="b"),
        call(ctx, "fs_apply_patch", patch=f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+x\n"),
    ):
        assert not result.ok, (path, result)
        assert "refusing to write" in result.content or "escapes" in result.content
    assert (ctx.root / ".git" / "config").read_bytes() == before
    assert not (ctx.root / ".coder").exists()
    assert (Path(ctx.root).parent / "outside" / "secret.txt").read_text() == "outside data\n"


def test_symlinks_inside_the_worktree_work(ctx: ToolContext) -> None:
    assert "def add" in call(ctx, "fs_read", path="link_in.py").content
    edited = call(ctx, "fs_edit", path="link_in.py", search="a + b", replace="b + a")
    assert edited.ok and "src/calc.py" in edited.content
    assert os.path.islink(ctx.root / "link_in.py")  # the link itself is kept
    assert "b + a" in read(ctx, "src/calc.py")


def test_doc_steps_write_only_docs(ctx: ToolContext) -> None:
    ctx.write_filter = doc_write_filter
    code = call(ctx, "fs_write", path="src/new.py", content="x = 1\n")
    assert not code.ok and "not documentation" in code.content
    assert call(ctx, "fs_write", path="docs/usage.md", content="# Usage\n").ok
    assert not call(ctx, "fs_edit", path="src/calc.py", search="a + b", replace="b + a").ok
    assert call(ctx, "fs_edit", path="README.md", search="# sample", replace="# Sample").ok
    patch = call(
        ctx,
        "fs_apply_patch",
        patch=(
            "--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-# Sample\n+# Title\n"
            "--- a/src/calc.py\n+++ b/src/calc.py\n@@ -2 +2 @@\n-    return a + b\n+    return 0\n"
        ),
    )
    assert not patch.ok and "src/calc.py" in patch.content
    assert read(ctx, "README.md") == "# Sample\n"  # nothing applied


# --------------------------------------------------------------------------- fs_read


def test_fs_read_numbers_lines_and_pages(ctx: ToolContext) -> None:
    whole = call(ctx, "fs_read", path="src/app.txt")
    assert whole.ok
    assert whole.content.splitlines()[0] == "    1| line 1"
    assert whole.content.endswith("[lines 1-10 of 10]")
    page = call(ctx, "fs_read", path="src/app.txt", offset=4, limit=3)
    assert page.content.splitlines()[:3] == ["    4| line 4", "    5| line 5", "    6| line 6"]
    assert page.content.endswith("[lines 4-6 of 10; call fs_read with offset=7 for more]")
    ctx.read_limit = 2
    assert call(ctx, "fs_read", path="src/app.txt").content.endswith("offset=3 for more]")
    past = call(ctx, "fs_read", path="src/app.txt", offset=11)
    assert not past.ok and "past the end" in past.content and "10 lines" in past.content


def test_fs_read_refuses_directories_binaries_and_missing_files(ctx: ToolContext) -> None:
    folder = call(ctx, "fs_read", path="src")
    assert not folder.ok and "directory" in folder.content and "fs_glob" in (folder.hint or "")
    (ctx.root / "blob.bin").write_bytes(b"\x89PNG\0\0\x01")
    binary = call(ctx, "fs_read", path="blob.bin")
    assert not binary.ok and "binary" in binary.content
    missing = call(ctx, "fs_read", path="nope.py")
    assert not missing.ok and "no such file: nope.py" in missing.content
    (ctx.root / "empty.txt").write_text("")
    assert call(ctx, "fs_read", path="empty.txt").content == "[empty.txt is empty]"


def test_fs_read_cuts_huge_lines(ctx: ToolContext) -> None:
    (ctx.root / "min.js").write_text("x" * 5000 + "\nshort\n")
    result = call(ctx, "fs_read", path="min.js")
    first = result.content.splitlines()[0]
    assert len(first) < 2100 and first.endswith("[... line cut: 3000 more chars]")
    assert "    2| short" in result.content


# --------------------------------------------------------------------------- fs_write


def test_fs_write_creates_new_files_only(ctx: ToolContext) -> None:
    result = call(ctx, "fs_write", path="pkg/sub/mod.py", content="A = 1\nB = 2\n")
    assert result.ok and result.content == "created pkg/sub/mod.py (2 lines, 12 bytes)"
    assert result.data["files_changed"] == ["pkg/sub/mod.py"]
    assert read(ctx, "pkg/sub/mod.py") == "A = 1\nB = 2\n"
    again = call(ctx, "fs_write", path="pkg/sub/mod.py", content="other\n")
    assert not again.ok and "already exists" in again.content and "fs_edit" in (again.hint or "")
    assert read(ctx, "pkg/sub/mod.py") == "A = 1\nB = 2\n"
    assert not call(ctx, "fs_write", path="link_in.py", content="x").ok  # a link counts too
    assert not call(ctx, "fs_write", path="src", content="x").ok
    assert [p.name for p in (ctx.root / "pkg" / "sub").iterdir()] == ["mod.py"]  # no temp left


# --------------------------------------------------------------------------- fs_edit


def test_fs_edit_replaces_a_unique_match(ctx: ToolContext) -> None:
    result = call(
        ctx,
        "fs_edit",
        path="src/calc.py",
        search="def sub(a, b):\n    return a - b\n",
        replace='def sub(a, b):\n    """a minus b"""\n    return a - b\n',
    )
    assert result.ok, result.as_text()
    assert result.content.startswith("edited src/calc.py: replaced 1 occurrence; lines 3-9")
    assert '    6|     """a minus b"""' in result.content
    assert '"""a minus b"""' in read(ctx, "src/calc.py")
    assert result.data == {"files_changed": ["src/calc.py"], "replacements": 1}


def test_fs_edit_no_match_shows_the_closest_lines(ctx: ToolContext) -> None:
    before = read(ctx, "src/calc.py")
    result = call(
        ctx,
        "fs_edit",
        path="src/calc.py",
        search="def mul(x, y):\n    return x * y\n",
        replace="pass\n",
    )
    assert not result.ok
    assert "Closest match, lines 9-10" in result.content
    assert "    9| def mul(a, b):" in result.content and "   10|     return a * b" in result.content
    assert "exactly" in (result.hint or "")
    assert read(ctx, "src/calc.py") == before


def test_fs_edit_whitespace_difference_is_called_out(ctx: ToolContext) -> None:
    result = call(
        ctx, "fs_edit", path="src/calc.py", search="def add(a, b):\n  return a + b", replace="x"
    )
    assert not result.ok
    assert "lines 1-2 match it except for whitespace" in result.content
    assert "indentation" in result.content


def test_fs_edit_line_number_prefixes_get_a_hint(ctx: ToolContext) -> None:
    result = call(
        ctx,
        "fs_edit",
        path="src/calc.py",
        search="    1| def add(a, b):\n    2|     return a + b",
        replace="x",
    )
    assert not result.ok and "line-number prefixes" in (result.hint or "")


def test_fs_edit_several_matches_are_listed(ctx: ToolContext) -> None:
    before = read(ctx, "src/calc.py")
    result = call(ctx, "fs_edit", path="src/calc.py", search="(a, b):", replace="(x, y):")
    assert not result.ok
    assert "occurs 3 times" in result.content and "at lines 1, 5, 9" in result.content
    assert "replace_all" in (result.hint or "")
    assert read(ctx, "src/calc.py") == before
    every = call(
        ctx, "fs_edit", path="src/calc.py", search="(a, b):", replace="(x, y):", replace_all=True
    )
    assert every.ok and "replaced 3 occurrences" in every.content
    assert read(ctx, "src/calc.py").count("(x, y):") == 3


def test_fs_edit_refuses_empty_identical_and_missing(ctx: ToolContext) -> None:
    assert "empty" in call(ctx, "fs_edit", path="src/calc.py", search="", replace="x").content
    same = call(ctx, "fs_edit", path="src/calc.py", search="a + b", replace="a + b")
    assert not same.ok and "identical" in same.content
    missing = call(ctx, "fs_edit", path="src/none.py", search="a", replace="b")
    assert not missing.ok and "fs_write" in (missing.hint or "")


def test_fs_edit_keeps_crlf_and_mode(ctx: ToolContext) -> None:
    path = ctx.root / "win.bat"
    path.write_bytes(b"@echo off\r\necho one\r\necho two\r\n")
    path.chmod(0o755)
    result = call(ctx, "fs_edit", path="win.bat", search="echo one\necho two", replace="echo 1")
    assert result.ok, result.as_text()
    assert path.read_bytes() == b"@echo off\r\necho 1\r\n"
    assert path.stat().st_mode & 0o777 == 0o755


def test_fs_edit_explains_a_redacted_search(ctx: ToolContext) -> None:
    result = call(
        ctx,
        "fs_edit",
        path="src/calc.py",
        search="KEY = '[REDACTED:known_secret]'",
        replace="KEY = 1",
    )
    assert not result.ok and "REDACTED" in (result.hint or "")


# --------------------------------------------------------------------------- fs_apply_patch

PATCH = """\
diff --git a/src/app.txt b/src/app.txt
--- a/src/app.txt
+++ b/src/app.txt
@@ -2,3 +2,3 @@
 line 2
-line 3
+line three
 line 4
"""


def test_fs_apply_patch_applies_and_dry_run_changes_nothing(ctx: ToolContext) -> None:
    dry = call(ctx, "fs_apply_patch", patch=PATCH, dry_run=True)
    assert dry.ok and "would change: M src/app.txt (+1 -1)" in dry.content
    assert read(ctx, "src/app.txt") == APP
    applied = call(ctx, "fs_apply_patch", patch=PATCH)
    assert applied.ok and applied.content == "applied: M src/app.txt (+1 -1)"
    assert read(ctx, "src/app.txt") == APP.replace("line 3\n", "line three\n")
    assert applied.data["files_changed"] == ["src/app.txt"]


def test_fs_apply_patch_accepts_plain_headers_fences_and_wrong_numbers(ctx: ToolContext) -> None:
    # No `diff --git` line, a markdown fence, a wrong start line and wrong counts.
    patch = (
        "```diff\n--- a/src/app.txt\n+++ b/src/app.txt\n@@ -1,9 +1,9 @@\n line 7\n"
        "-line 8\n+line eight\n+line 8.5\n line 9\n```\n"
    )
    result = call(ctx, "fs_apply_patch", patch=patch)
    assert result.ok, result.as_text()
    assert "line 7\nline eight\nline 8.5\nline 9\n" in read(ctx, "src/app.txt")


def test_fs_apply_patch_creates_and_deletes_files(ctx: ToolContext) -> None:
    patch = (
        "--- /dev/null\n+++ b/docs/new.md\n@@ -0,0 +1,2 @@\n+# New\n+text\n"
        "--- a/src/pkg/deep.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-X = 1\n"
    )
    result = call(ctx, "fs_apply_patch", patch=patch)
    assert result.ok, result.as_text()
    assert "A docs/new.md (+2 -0)" in result.content
    assert "D src/pkg/deep.py (+0 -1)" in result.content
    assert read(ctx, "docs/new.md") == "# New\ntext\n"
    assert not (ctx.root / "src/pkg/deep.py").exists()
    again = call(ctx, "fs_apply_patch", patch="--- /dev/null\n+++ b/README.md\n@@ -0,0 +1 @@\n+x\n")
    assert not again.ok and "already exists" in again.content


def test_fs_apply_patch_reports_the_failing_hunk(ctx: ToolContext) -> None:
    patch = (
        "--- a/src/app.txt\n+++ b/src/app.txt\n@@ -1,2 +1,2 @@\n line 1\n-line 2\n+two\n"
        "@@ -8,3 +8,3 @@\n line 8\n-line nine\n+nine\n line 10\n"
    )
    result = call(ctx, "fs_apply_patch", patch=patch)
    assert not result.ok
    assert "hunk 2 of 2 for src/app.txt" in result.content
    assert "Closest text in the file, lines 8-10" in result.content
    assert "    9| line 9" in result.content
    assert "fs_read" in (result.hint or "")
    assert read(ctx, "src/app.txt") == APP  # hunk 1 was not applied either


def test_fs_apply_patch_is_all_or_nothing_across_files(ctx: ToolContext) -> None:
    patch = PATCH + "--- a/src/calc.py\n+++ b/src/calc.py\n@@ -1 +1 @@\n-def nope():\n+x\n"
    result = call(ctx, "fs_apply_patch", patch=patch)
    assert not result.ok and "src/calc.py" in result.content
    assert read(ctx, "src/app.txt") == APP


def test_fs_apply_patch_refuses_git_paths_and_garbage(ctx: ToolContext) -> None:
    patch = (
        "diff --git a/.git/config b/.git/config\n--- a/.git/config\n+++ b/.git/config\n"
        "@@ -1 +1 @@\n-[core]\n+[core]\n+\thooksPath = /tmp\n"
    )
    result = call(ctx, "fs_apply_patch", patch=patch)
    assert not result.ok and ".git" in result.content
    assert "hooksPath" not in read(ctx, ".git/config")
    garbage = call(ctx, "fs_apply_patch", patch="please change line 3")
    assert not garbage.ok and "no file changes" in garbage.content
    bad_header = call(ctx, "fs_apply_patch", patch="--- a/x\n+++ b/x\n@@ bad @@\n+x\n")
    assert not bad_header.ok and "bad hunk header" in bad_header.content


# --------------------------------------------------------------------------- fs_glob


def test_fs_glob_matches_sorted_and_skips_noise(ctx: ToolContext) -> None:
    root = ctx.root
    (root / "node_modules" / "lib").mkdir(parents=True)
    (root / "node_modules" / "lib" / "x.py").write_text("")
    (root / "src" / "__pycache__").mkdir()
    (root / "src" / "__pycache__" / "calc.cpython-311.pyc").write_text("")
    (root / "build").mkdir()
    (root / "build" / "gen.py").write_text("")
    (root / ".gitignore").write_text("build/\n")
    result = call(ctx, "fs_glob", pattern="**/*.py")
    assert result.content.splitlines() == [
        "link_in.py",
        "src/calc.py",
        "src/pkg/deep.py",
        "[3 files]",
    ]
    assert call(ctx, "fs_glob", pattern="*.py").content == result.content  # any depth
    assert call(ctx, "fs_glob", pattern="src/*.py").content.splitlines()[0] == "src/calc.py"
    listing = call(ctx, "fs_glob", pattern="src").content.splitlines()
    assert listing == ["src/app.txt", "src/calc.py", "src/pkg/deep.py", "[3 files]"]
    assert call(ctx, "fs_glob", pattern="src/*.{py,txt}").data["count"] == 2
    everything = call(ctx, "fs_glob", pattern="**").content
    assert ".git/" not in everything and "outside" not in everything
    assert "link_out.txt" not in everything and "dir_out" not in everything
    limited = call(ctx, "fs_glob", pattern="**", limit=2)
    assert limited.content.splitlines()[-1].startswith("[showing the first 2 of")
    assert "no files match" in call(ctx, "fs_glob", pattern="*.rs").content
    assert not call(ctx, "fs_glob", pattern="../*").ok


def test_glob_regex() -> None:
    rx = glob_regex
    assert rx("**/*.py").fullmatch("a.py") and rx("**/*.py").fullmatch("a/b/c.py")
    assert not rx("src/*.py").fullmatch("src/a/b.py")
    assert rx("src/**/test_?.py").fullmatch("src/x/y/test_a.py")
    assert rx("[!a]*.md").fullmatch("b.md") and not rx("[!a]*.md").fullmatch("a.md")


# --------------------------------------------------------------------------- fs_grep


def test_fs_grep_finds_lines_with_limits_and_filters(ctx: ToolContext) -> None:
    result = call(ctx, "fs_grep", pattern=r"return a [-*]")
    assert result.content.splitlines() == [
        "src/calc.py:6:     return a - b",
        "src/calc.py:10:     return a * b",
    ]
    assert call(ctx, "fs_grep", pattern="LINE 1$", ignore_case=True).content.startswith(
        "src/app.txt:1: line 1"
    )
    only = call(ctx, "fs_grep", pattern="line|def", glob="*.txt")
    assert {ln.split(":")[0] for ln in only.content.splitlines()} == {"src/app.txt"}
    limited = call(ctx, "fs_grep", pattern="line", limit=3)
    assert len([ln for ln in limited.content.splitlines() if ln.startswith("src/")]) == 3
    assert "showing the first 3 matches" in limited.content
    assert call(ctx, "fs_grep", pattern="a + b(", literal=True).ok
    assert "no matches" in call(ctx, "fs_grep", pattern="zzz_nothing").content


def test_fs_grep_skips_git_binaries_and_links_out(ctx: ToolContext) -> None:
    (ctx.root / "blob.bin").write_bytes(b"line 1\0binary")
    result = call(ctx, "fs_grep", pattern="line 1|outside data|initial|repositoryformatversion")
    files = {ln.split(":")[0] for ln in result.content.splitlines() if not ln.startswith("[")}
    assert files == {"src/app.txt"}
    assert "skipped files: 1 binary" in result.content


def test_fs_grep_regex_error_has_a_hint(ctx: ToolContext) -> None:
    result = call(ctx, "fs_grep", pattern="add(a, b")
    assert not result.ok and "invalid regular expression" in result.content
    assert "literal=true" in (result.hint or "")


def test_fs_grep_stops_a_catastrophic_regex(
    ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(grep, "GREP_TIMEOUT_S", 1.0)
    (ctx.root / "evil.txt").write_text("a" * 40 + "!\n")
    result = call(ctx, "fs_grep", pattern=r"(a+)+$", glob="evil.txt")
    assert not result.ok and "too slow" in result.content


def test_fs_apply_patch_tolerates_bare_headers_blank_context_and_crlf(ctx: ToolContext) -> None:
    # A bare @@, and a blank context line whose leading space the model dropped.
    result = call(
        ctx,
        "fs_apply_patch",
        patch=(
            "--- a/src/calc.py\n+++ b/src/calc.py\n@@\n     return a - b\n\n\n"
            "-def mul(a, b):\n+def times(a, b):\n"
        ),
    )
    assert result.ok, result.as_text()
    assert "def times(a, b):" in read(ctx, "src/calc.py")
    ambiguous = call(
        ctx,
        "fs_apply_patch",
        patch=(
            "--- a/src/calc.py\n+++ b/src/calc.py\n@@\n-def add(a, b):\n+def plus(a, b):\n"
            "@@\n-\n+# blank\n"
        ),
    )
    assert not ambiguous.ok and "matches at lines" in ambiguous.content
    (ctx.root / "dos.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    crlf = call(
        ctx, "fs_apply_patch", patch="--- a/dos.txt\n+++ b/dos.txt\n@@ -2 +2 @@\n-two\n+2\n"
    )
    assert crlf.ok, crlf.as_text()
    assert (ctx.root / "dos.txt").read_bytes() == b"one\r\n2\r\nthree\r\n"


def test_fs_apply_patch_follows_links_inside_the_worktree(ctx: ToolContext) -> None:
    patch = (
        "--- a/link_in.py\n+++ b/link_in.py\n@@ -2 +2 @@\n-    return a + b\n+    return b + a\n"
    )
    result = call(ctx, "fs_apply_patch", patch=patch)
    assert result.ok and "M src/calc.py" in result.content
    assert os.path.islink(ctx.root / "link_in.py") and "b + a" in read(ctx, "src/calc.py")
    delete = call(
        ctx,
        "fs_apply_patch",
        patch="--- a/link_in.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-def add(a, b):\n",
    )
    assert not delete.ok and "symbolic link" in delete.content


def test_fs_read_refuses_a_fifo(ctx: ToolContext) -> None:
    os.mkfifo(ctx.root / "pipe")
    result = call(ctx, "fs_read", path="pipe")
    assert not result.ok and "not a regular file" in result.content
    assert "pipe" not in call(ctx, "fs_glob", pattern="**").content
    assert call(ctx, "fs_grep", pattern="anything").ok  # the fifo is not opened


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        # the last line changed: git's own diff of such a file marks both sides
        (
            "@@ -2,2 +2,2 @@\n two\n-three\n\\ No newline at end of file\n+THREE\n"
            "\\ No newline at end of file\n",
            b"one\r\ntwo\r\nTHREE",
        ),
        # a line before it changed: the last line is context, still without its newline
        (
            "@@ -1,3 +1,3 @@\n-one\n+ONE\n two\n three\n\\ No newline at end of file\n",
            b"ONE\r\ntwo\r\nthree",
        ),
        # a line added at the end: the old last line gains its line end (CRLF, as the file's)
        (
            "@@ -3 +3,2 @@\n-three\n\\ No newline at end of file\n+three\n+four\n"
            "\\ No newline at end of file\n",
            b"one\r\ntwo\r\nthree\r\nfour",
        ),
        # git's marker left out, as models do: the file still ends without a line end
        ("@@ -3 +3 @@\n-three\n+THREE\n", b"one\r\ntwo\r\nTHREE"),
        ("@@ -2,2 +2,3 @@\n two\n+2.5\n three\n", b"one\r\ntwo\r\n2.5\r\nthree"),
        ("@@ -1,3 +1,2 @@\n one\n-two\n three\n", b"one\r\nthree"),
    ],
)
@pytest.mark.parametrize("newline", ["\r\n", "\n"])
def test_fs_apply_patch_to_a_file_without_a_final_newline(
    ctx: ToolContext, patch: str, expected: bytes, newline: str
) -> None:
    """A file (CRLF or LF) whose last line has no line end: the model's patch (written with
    \\n, as it sees the file, with or without git's marker) applies, the file keeps its line
    ends, and its last line stays without one unless the patch gives it one."""
    (ctx.root / "dos.txt").write_bytes(b"one\r\ntwo\r\nthree".replace(b"\r\n", newline.encode()))
    result = call(ctx, "fs_apply_patch", patch="--- a/dos.txt\n+++ b/dos.txt\n" + patch)
    assert result.ok, result.as_text()
    assert (ctx.root / "dos.txt").read_bytes() == expected.replace(b"\r\n", newline.encode())


def test_the_protected_path_hint_is_made_from_the_table(ctx: ToolContext) -> None:
    result = call(ctx, "fs_write", path=".gitmodules", content="x\n")
    first: dict[str, str] = {}
    for pattern, why in TABLE:  # one pattern of each reason the table gives
        first.setdefault(why, pattern)
    assert not result.ok and not (ctx.root / ".gitmodules").exists()
    assert [p for p in first.values() if p not in (result.hint or "")] == []
