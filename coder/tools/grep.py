"""fs_grep: search file contents with a Python regular expression.

The regex runs in a child process with a time limit (`GREP_TIMEOUT_S`), because Python's `re`
can backtrack for ever on a pattern like `(a+)+$` and cannot be interrupted in-process; a
regex error says how to escape. Files are the ones fs_glob would list (`fs.walk_files`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Required, TypedDict

from coder.redact import is_env_file
from coder.tools.base import Tool, ToolContext, ToolResult, params, prop
from coder.tools.envfiles import register_env_file
from coder.tools.fs import walk_files
from coder.tools.worktree import glob_regex, normalize_glob, real_root

GREP_TIMEOUT_S = 10.0
GREP_MAX_FILE_BYTES = 2 << 20
GREP_MAX_LINE = 10_000  # longer lines are searched in their first GREP_MAX_LINE chars
GREP_SHOW_CHARS = 300

# Runs in a child process (python -I -S -u): reads a JSON request on stdin, prints one JSON
# line per match, then a summary line. The parent kills it after GREP_TIMEOUT_S.
_GREP_WORKER = r"""
import json, os, re, sys
req = json.load(sys.stdin)
rx = re.compile(req["pattern"], req["flags"])
limit, found = req["limit"], 0
stats = {"binary": 0, "large": 0, "long_lines": 0, "unreadable": 0}
for rel, path in req["files"]:
    try:
        if os.stat(path).st_size > req["max_bytes"]:
            stats["large"] += 1
            continue
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        stats["unreadable"] += 1
        continue
    if b"\0" in data[:8192]:
        stats["binary"] += 1
        continue
    for no, line in enumerate(data.decode("utf-8", "replace").split("\n"), 1):
        if len(line) > req["max_line"]:
            stats["long_lines"] += 1
            line = line[:req["max_line"]]
        if rx.search(line):
            found += 1
            if found > limit:
                break
            sys.stdout.write(json.dumps([rel, no, line.rstrip("\r")[:req["show"]]]) + "\n")
    if found > limit:
        break
stats["more"] = found > limit
sys.stdout.write(json.dumps(stats) + "\n")
"""


class GrepArgs(TypedDict, total=False):
    pattern: Required[str]
    glob: str
    limit: int
    ignore_case: bool
    literal: bool


def fs_grep(ctx: ToolContext, args: GrepArgs) -> ToolResult:
    pattern = args["pattern"]
    limit = min(max(1, int(args.get("limit", 100))), 1000)
    flags = re.IGNORECASE if args.get("ignore_case") else 0
    regex = re.escape(pattern) if args.get("literal") else pattern
    if not pattern:
        return ToolResult.error("pattern is empty", hint="give a regular expression or text")
    try:
        re.compile(regex, flags)
    except re.error as exc:
        return ToolResult.error(
            f"invalid regular expression {pattern!r}: {exc}",
            hint="fs_grep takes a Python regex: escape ( ) [ ] { } . * + ? | \\ with a backslash, "
            "or set literal=true to search plain text",
        )
    root = real_root(ctx)
    files = sorted(walk_files(root, links=False))  # a link inside would only repeat its target
    if args.get("glob"):
        rx = glob_regex(normalize_glob(ctx, args["glob"]))
        files = [f for f in files if rx.fullmatch(f)]
    request = json.dumps(
        {
            "pattern": regex,
            "flags": flags,
            "limit": limit,
            "max_bytes": GREP_MAX_FILE_BYTES,
            "max_line": GREP_MAX_LINE,
            "show": GREP_SHOW_CHARS,
            "files": [[f, os.path.join(root, f)] for f in files],
        }
    )
    rows, stats, timed_out, err = _run_grep(request)
    if not timed_out and not stats:
        return ToolResult.error("the search failed: " + err[-500:])
    for rel in {r[0] for r in rows}:
        if is_env_file(rel.rsplit("/", 1)[-1]):
            register_env_file(Path(root) / rel, ctx.redactor)
    lines = [f"{rel}:{no}: {text}" for rel, no, text in rows]
    notes = _grep_notes(stats, timed_out=timed_out, limit=limit)
    head = "\n".join(lines) if lines else f"no matches for {pattern!r} in {len(files)} files"
    text = head + "".join(f"\n[{n}]" for n in notes)
    data = {"count": len(rows), "files_searched": len(files), "timed_out": timed_out}
    if timed_out and not rows:
        return ToolResult.error(notes[0], hint="simplify the regular expression", data=data)
    return ToolResult(True, text, data=data)


def _run_grep(request: str) -> tuple[list[list[Any]], dict[str, int], bool, str]:
    """The worker's matches, its summary (empty when it failed), whether it was stopped
    after GREP_TIMEOUT_S, and what it printed on stderr."""
    timed_out = False
    try:
        proc = subprocess.run(
            [sys.executable, "-I", "-S", "-u", "-c", _GREP_WORKER],
            input=request.encode(),
            capture_output=True,
            timeout=GREP_TIMEOUT_S,
            env={},
            check=False,
        )
        out, err = proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        timed_out, out, err = True, exc.stdout or b"", b""
    rows = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
    stats: dict[str, int] = rows.pop() if rows and isinstance(rows[-1], dict) else {}
    return rows, stats, timed_out, err.decode(errors="replace")


def _grep_notes(stats: dict[str, int], *, timed_out: bool, limit: int) -> list[str]:
    """What the model is told about a search it sees only part of."""
    notes = []
    if timed_out:
        notes.append(
            f"search stopped after {GREP_TIMEOUT_S:g}s: the pattern is too slow "
            "(avoid nested repetition like (a+)+ or many .* in a row); partial results"
        )
    if stats.get("more"):
        notes.append(f"showing the first {limit} matches; narrow the pattern or use glob=")
    skipped = [
        f"{stats[k]} {what}"
        for k, what in (
            ("binary", "binary"),
            ("large", f"larger than {GREP_MAX_FILE_BYTES >> 20} MB"),
        )
        if stats.get(k)
    ]
    if skipped:
        notes.append("skipped files: " + ", ".join(skipped))
    if stats.get("long_lines"):
        notes.append(
            f"{stats['long_lines']} lines longer than {GREP_MAX_LINE} chars were "
            "searched only in their beginning"
        )
    return notes


FS_GREP = Tool(
    name="fs_grep",
    description=(
        "Search file contents with a Python regular expression; prints path:line: text "
        "for each matching line (default at most 100). Binary and files over 2 MB are "
        "skipped."
    ),
    parameters=params(
        {
            "pattern": prop(
                "string", "Python regular expression (or plain text with literal=true)."
            ),
            "glob": prop(
                "string", "Only search files matching this glob, e.g. **/*.py (optional)."
            ),
            "limit": prop("integer", "Maximum number of matching lines (default 100)."),
            "ignore_case": prop("boolean", "Case-insensitive search (default false)."),
            "literal": prop("boolean", "Treat pattern as plain text, not a regex (default false)."),
        },
        required=["pattern"],
    ),
    handler=fs_grep,
    read_only=True,
)
