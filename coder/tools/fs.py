"""File tools: read (paged, line-numbered), write (new files only), edit (one exact
search/replace) and glob (grep is grep.py). Every path goes through `policy.resolve_in_root`,
so nothing outside the worktree is read or written, through `..`, absolute paths or symlinks
alike.

Errors are written for a small model to fix its next call: a failed edit shows the closest
text in the file with its line numbers and says when only whitespace differs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Required, TypedDict

from coder.git.workdir import ignored_dirs
from coder.redact import is_env_file
from coder.tools import feedback
from coder.tools.base import Tool, ToolContext, ToolResult, params, prop
from coder.tools.envfiles import register_env_file
from coder.tools.proposal import FileChange, Proposal
from coder.tools.worktree import (
    closest_match,
    glob_regex,
    normalize_glob,
    numbered,
    real_root,
    resolve,
    write_in_root,
)

MAX_LINE_CHARS = 2000  # fs_read cuts longer lines
READ_CHAR_BUDGET = 60_000  # one fs_read page never returns more (then it ends early)
MAX_READ_LINES = 2000
MAX_WRITE_BYTES = 2 << 20
SNIPPET_LINES = 40
MAX_WALK_FILES = 200_000
SKIP_DIRS = frozenset(
    {
        ".git",
        ".coder",
        "node_modules",
        ".venv",
        "venv",
        "__pycache__",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".tox",
        ".nox",
        ".hg",
        ".svn",
        ".idea",
        ".eggs",
    }
)


# --------------------------------------------------------------------------- shared helpers


class ReadArgs(TypedDict, total=False):
    path: Required[str]
    offset: int
    limit: int


class WriteArgs(TypedDict):
    path: str
    content: str


class EditArgs(TypedDict, total=False):
    path: Required[str]
    search: Required[str]
    replace: Required[str]
    replace_all: bool


class GlobArgs(TypedDict, total=False):
    pattern: Required[str]
    limit: int


def is_binary(head: bytes) -> bool:
    return b"\0" in head[:8192]


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


# --------------------------------------------------------------------------- fs_read


def _cut(line: str) -> str:
    if len(line) <= MAX_LINE_CHARS:
        return line
    return line[:MAX_LINE_CHARS] + f" [... line cut: {len(line) - MAX_LINE_CHARS} more chars]"


def fs_read(ctx: ToolContext, args: ReadArgs) -> ToolResult:
    real, rel = resolve(ctx, args["path"], write=False)
    if real.is_dir():
        return ToolResult.error(
            f"{rel} is a directory, not a file",
            hint=f'list its files with fs_glob(pattern="{rel}/*")',
        )
    if not real.exists():
        return ToolResult.error(f"no such file: {rel}", hint="find files with fs_glob or fs_grep")
    if not real.is_file():
        return ToolResult.error(f"{rel} is not a regular file", hint="only files can be read")
    offset = max(1, int(args.get("offset", 1)))
    limit = min(max(1, int(args.get("limit", ctx.read_limit))), MAX_READ_LINES)
    if is_env_file(real.name):
        register_env_file(real, ctx.redactor)  # before any of its text is returned
    shown: list[str] = []
    chars = 0
    total = 0
    with open(real, "rb") as f:
        if is_binary(f.read(8192)):
            return ToolResult.error(
                f"{rel} is a binary file",
                hint="only text files can be read; use shell_run for tools "
                "like `od` or `file` in custom steps",
            )
        f.seek(0)
        for total, raw in enumerate(f, 1):
            if offset <= total < offset + limit and chars < READ_CHAR_BUDGET:
                line = _cut(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
                shown.append(line)
                chars += len(line) + 8
    if total == 0:
        return ToolResult(True, f"[{rel} is empty]", data={"path": rel, "lines": 0})
    if offset > total:
        return ToolResult.error(
            f"offset {offset} is past the end of {rel} ({total} lines)",
            hint=f"call fs_read with an offset between 1 and {total}",
        )
    last = offset + len(shown) - 1
    if last < total:
        footer = f"[lines {offset}-{last} of {total}; call fs_read with offset={last + 1} for more]"
    else:
        footer = f"[lines {offset}-{last} of {total}]"
    body = numbered(shown, offset, width=max(5, len(str(last))))
    return ToolResult(
        True, f"{body}\n{footer}", data={"path": rel, "first": offset, "last": last, "lines": total}
    )


# --------------------------------------------------------------------------- fs_write


def _planned_write(ctx: ToolContext, args: WriteArgs) -> tuple[str, bytes] | ToolResult:
    """fs_write up to the write: (the file, its content), or why it would be refused."""
    path, content = args["path"], args["content"]
    if path.endswith(("/", os.sep)):
        return ToolResult.error(f"{path} names a directory", hint="give a file path")
    real, rel = resolve(ctx, path, write=True)
    if os.path.lexists(real):
        return ToolResult.error(
            f"{rel} already exists; fs_write only creates new files",
            hint="to change an existing file use fs_edit (or fs_apply_patch)",
        )
    data = content.encode("utf-8", errors="surrogateescape")
    if len(data) > MAX_WRITE_BYTES:
        return ToolResult.error(
            f"content is {len(data)} bytes; the limit is {MAX_WRITE_BYTES}",
            hint="split it into several files",
        )
    refused = feedback.veto(ctx, rel, None, data)
    return refused if refused is not None else (rel, data)


def fs_write(ctx: ToolContext, args: WriteArgs) -> ToolResult:
    planned = _planned_write(ctx, args)
    if isinstance(planned, ToolResult):
        return planned
    rel, data = planned
    write_in_root(ctx, rel, data, mode=0o644, new_only=True)
    content = args["content"]
    lines = content.count("\n") + (1 if content and not content.endswith("\n") else 0)
    lint = feedback.Lint(ctx).after([rel])
    return ToolResult(
        True,
        f"created {rel} ({lines} lines, {len(data)} bytes)" + (f"\n{lint}" if lint else ""),
        data={"files_changed": [rel]},
    )


def preview_write(ctx: ToolContext, args: WriteArgs) -> Proposal | ToolResult:
    planned = _planned_write(ctx, args)
    if isinstance(planned, ToolResult):
        return planned
    rel, data = planned
    return Proposal("fs_write", (FileChange(rel, None, data),), arguments=args)


# --------------------------------------------------------------------------- fs_edit

_LINE_NUMBER_PREFIX = re.compile(r"^\s*\d+\| ?")


def _occurrences(text: str, search: str) -> list[int]:
    found, pos = [], text.find(search)
    while pos >= 0:
        found.append(pos)
        pos = text.find(search, pos + 1)  # overlapping ones count: "aa" is twice in "aaa"
    return found


def _no_match(rel: str, text: str, search: str) -> ToolResult:
    lines = text.split("\n")
    target = search.strip("\n").split("\n")
    hint = (
        "search must match the file exactly, whitespace included: copy it from fs_read "
        "output without the line numbers, and read the file again if it may have changed"
    )
    if "[REDACTED" in search:
        hint = (
            "your search contains a [REDACTED:...] placeholder: the file holds a secret there "
            "that you cannot see. Choose a search block of nearby lines without it"
        )
    elif all(_LINE_NUMBER_PREFIX.match(t) for t in target if t.strip()):
        hint = (
            "remove the line-number prefixes (like '   12| ') that fs_read adds; they are "
            "not part of the file"
        )
    stripped = [t.strip() for t in target]
    file_stripped = [t.strip() for t in lines]
    n = len(target)
    for i in range(0, len(lines) - n + 1):
        if file_stripped[i] == stripped[0] and file_stripped[i : i + n] == stripped:
            return ToolResult.error(
                f"search text not found in {rel}, but lines {i + 1}-{i + n} match it except for "
                f"whitespace (indentation, tabs vs spaces or trailing spaces):\n"
                + numbered(lines[i : i + n], i + 1),
                hint="copy the exact whitespace of those lines into search (and keep the "
                "file's indentation in replace)",
            )
    best = closest_match(lines, target)
    if best is None or best[2] < 0.3:
        head = lines[:20]
        return ToolResult.error(
            f"search text not found in {rel}, and nothing similar; the file starts with:\n"
            + numbered(head, 1),
            hint=hint,
        )
    start, end, ratio = best
    return ToolResult.error(
        f"search text not found in {rel}. Closest match, lines {start + 1}-{end} "
        f"({ratio:.0%} similar):\n" + numbered(lines[start:end], start + 1),
        hint=hint,
        data={"closest": [start + 1, end]},
    )


def _many_matches(rel: str, text: str, starts: list[int], search: str) -> ToolResult:
    lines = text.split("\n")
    at = [_line_of(text, s) for s in starts]
    span = search.count("\n") + 1
    shown = []
    for line in at[:5]:
        first = max(1, line - 1)
        shown.append(numbered(lines[first - 1 : line + span], first))
    listed = ", ".join(map(str, at[:20])) + (" ..." if len(at) > 20 else "")
    return ToolResult.error(
        f"search text occurs {len(at)} times in {rel} (at lines {listed}):\n"
        + "\n  ...\n".join(shown),
        hint="include a few more surrounding lines in search (and replace) so it matches exactly "
        "once, or set replace_all=true to change every occurrence",
        data={"lines": at},
    )


@dataclass(frozen=True)
class _Edit:
    """fs_edit worked out, not yet written."""

    rel: str
    raw: bytes  # the file as it is
    out: bytes  # the file as the edit leaves it
    mode: int
    new: str  # `out` as text with \n line ends
    first: int  # the first edited line
    replace: str
    count: int


def _planned_edit(ctx: ToolContext, args: EditArgs) -> _Edit | ToolResult:
    """fs_edit up to the write: the edit, or why it would be refused."""
    search, replace = args["search"], args["replace"]
    replace_all = bool(args.get("replace_all", False))
    real, rel = resolve(ctx, args["path"], write=True)
    if real.is_dir():
        return ToolResult.error(f"{rel} is a directory", hint="give a file path")
    if not real.exists():
        return ToolResult.error(
            f"no such file: {rel}", hint="to create a new file use fs_write; fs_glob lists files"
        )
    if not real.is_file():
        return ToolResult.error(f"{rel} is not a regular file", hint="only files can be edited")
    if not search:
        return ToolResult.error(
            "search is empty",
            hint="search must be existing text of the file (to create a file "
            "use fs_write; to append, search for the last lines)",
        )
    raw = real.read_bytes()
    if is_binary(raw):
        return ToolResult.error(f"{rel} is a binary file", hint="only text files can be edited")
    text = raw.decode("utf-8", errors="surrogateescape")  # round-trips any byte exactly
    crlf = "\r\n" in text and text.count("\r\n") == text.count("\n")
    if crlf:  # the model sees (and writes) \n; keep the file's line endings
        text = text.replace("\r\n", "\n")
        search, replace = search.replace("\r\n", "\n"), replace.replace("\r\n", "\n")
    if search == replace:
        return ToolResult.error(
            "search and replace are identical: nothing would change",
            hint="put the new text in replace",
        )
    starts = _occurrences(text, search)
    if not starts:
        return _no_match(rel, text, search)
    if len(starts) > 1 and not replace_all:
        return _many_matches(rel, text, starts, search)
    if replace_all:
        new = text.replace(search, replace)
        count = text.count(search)
    else:
        new, count = text[: starts[0]] + replace + text[starts[0] + len(search) :], 1
    out = (new.replace("\n", "\r\n") if crlf else new).encode("utf-8", errors="surrogateescape")
    refused = feedback.veto(ctx, rel, raw, out)
    if refused is not None:
        return refused
    mode = real.stat().st_mode & 0o7777
    return _Edit(rel, raw, out, mode, new, _line_of(new, starts[0]), replace, count)


def fs_edit(ctx: ToolContext, args: EditArgs) -> ToolResult:
    edit = _planned_edit(ctx, args)
    if isinstance(edit, ToolResult):
        return edit
    rel = edit.rel
    lint = feedback.Lint(ctx)
    lint.before([rel])
    write_in_root(ctx, rel, edit.out, mode=edit.mode)
    # Show the edited region (first occurrence) so the model can check it without a re-read.
    first, replace, count = edit.first, edit.replace, edit.count
    last = first + (replace[:-1] if replace.endswith("\n") else replace).count("\n")
    lines = edit.new.split("\n")
    if lines[-1] == "":
        lines.pop()  # the "line" after the final newline
    lo, hi = max(1, first - 2), min(len(lines), last + 2, first - 2 + SNIPPET_LINES)
    notes = lint.after([rel])
    return ToolResult(
        True,
        f"edited {rel}: replaced {count} occurrence{'s' if count > 1 else ''}; lines {lo}-{hi} "
        f"now read:\n" + numbered(lines[lo - 1 : hi], lo) + (f"\n{notes}" if notes else ""),
        data={"files_changed": [rel], "replacements": count},
    )


def preview_edit(ctx: ToolContext, args: EditArgs) -> Proposal | ToolResult:
    edit = _planned_edit(ctx, args)
    if isinstance(edit, ToolResult):
        return edit
    change = FileChange(edit.rel, edit.raw, edit.out, edit.mode)
    return Proposal("fs_edit", (change,), arguments=args)


# --------------------------------------------------------------------------- walking, globs


def walk_files(root: str, *, links: bool = True) -> Iterator[str]:
    """Repo-relative posix paths of the regular files under `root`, sorted depth-first.
    Symlinked directories are not entered; symlinks leading outside the root (all symlinks with
    links=False) are left out, and so are fifos and devices (reading one could block).
    SKIP_DIRS and git-ignored directories are pruned. At most MAX_WALK_FILES."""
    ignored = ignored_dirs(root)
    inside = root.rstrip("/") + "/"
    count = 0
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        try:
            with os.scandir(os.path.join(root, rel_dir)) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        subdirs = []
        for entry in entries:
            rel = rel_dir + entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    if (
                        entry.name not in SKIP_DIRS
                        and not entry.name.endswith(".egg-info")
                        and not (ignored and ignored(rel))
                    ):
                        subdirs.append(rel + "/")
                    continue
                if entry.is_symlink():
                    target = os.path.realpath(entry.path)
                    if not links or not (target.startswith(inside) and os.path.isfile(target)):
                        continue
                elif not entry.is_file(follow_symlinks=False):
                    continue
            except OSError:
                continue
            yield rel
            count += 1
            if count >= MAX_WALK_FILES:
                return
        stack.extend(reversed(subdirs))


def fs_glob(ctx: ToolContext, args: GlobArgs) -> ToolResult:
    pattern = normalize_glob(ctx, args["pattern"])
    limit = min(max(1, int(args.get("limit", 200))), 2000)
    rx = glob_regex(pattern)
    matches = sorted(p for p in walk_files(real_root(ctx)) if rx.fullmatch(p))
    if not matches:
        return ToolResult(
            True,
            f"no files match {pattern!r}",
            data={"count": 0},
            hint="try a broader pattern such as **/*.py",
        )
    shown = matches[:limit]
    footer = (
        f"[{len(matches)} files]"
        if len(matches) <= limit
        else f"[showing the first {limit} of {len(matches)} files; narrow the pattern]"
    )
    return ToolResult(
        True, "\n".join(shown) + "\n" + footer, data={"count": len(matches), "files": shown}
    )


# --------------------------------------------------------------------------- definitions

FS_READ = Tool(
    name="fs_read",
    description=(
        "Read a text file with line numbers, a page at a time (default 400 lines); "
        "the footer tells the offset of the next page. Line numbers are not part of "
        "the file."
    ),
    parameters=params(
        {
            "path": prop("string", "File path relative to the repository root."),
            "offset": prop("integer", "First line to read, 1-based (default 1)."),
            "limit": prop("integer", "Number of lines to read (default 400, at most 2000)."),
        },
        required=["path"],
    ),
    handler=fs_read,
    read_only=True,
)
FS_WRITE = Tool(
    name="fs_write",
    description=(
        "Create a NEW file with the given content (parent directories are created). It "
        "refuses to overwrite: to change an existing file use fs_edit."
    ),
    parameters=params(
        {
            "path": prop("string", "Path of the new file, relative to the repository root."),
            "content": prop("string", "The complete file content."),
        },
        required=["path", "content"],
    ),
    handler=fs_write,
    read_only=False,
    preview=preview_write,
)
FS_EDIT = Tool(
    name="fs_edit",
    description=(
        "Change an existing file: replace the exact text `search` with `replace`. "
        "search must match exactly once (whitespace included, no line numbers); "
        "include surrounding lines to make it unique. One change per call."
    ),
    parameters=params(
        {
            "path": prop("string", "File path relative to the repository root."),
            "search": prop(
                "string", "Exact existing text to find (one or more whole lines is best)."
            ),
            "replace": prop("string", "Text to put in its place (empty string deletes it)."),
            "replace_all": prop(
                "boolean",
                "Replace every occurrence instead of requiring exactly one (default false).",
            ),
        },
        required=["path", "search", "replace"],
    ),
    handler=fs_edit,
    read_only=False,
    preview=preview_edit,
)
FS_GLOB = Tool(
    name="fs_glob",
    description=(
        "List files whose path matches a glob, sorted (e.g. src/**/*.py; *.md matches at "
        "any depth; a directory name lists everything below it). Skips .git, git-ignored "
        "and dependency/cache directories."
    ),
    parameters=params(
        {
            "pattern": prop("string", "Glob relative to the repository root: * ? ** [abc] {a,b}."),
            "limit": prop("integer", "Maximum number of paths to list (default 200)."),
        },
        required=["pattern"],
    ),
    handler=fs_glob,
    read_only=True,
)
