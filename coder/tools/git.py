"""Git tools: read-only status/diff/log, and fs_apply_patch (unified diffs applied by libgit2).

There is no commit tool: commits belong to the executor (one per step, with trailers).

fs_apply_patch is forgiving about what small models get wrong in a unified diff and strict
about what it changes. It rebuilds every file section before libgit2 sees it: `diff --git`
headers added (libgit2 needs them), markdown fences dropped, hunk line counts recounted, and
each hunk moved to where its context and removed lines really are (nearest to the stated line,
like `patch`'s offset). Every target path passes the path guard and the step's write filter
first; nothing is written unless every hunk of every file applies. A hunk that does not match
is reported with the lines it expected and the closest text in the file, with line numbers.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Required, TypedDict

from coder.errors import PatchProblem
from coder.files import nofollow
from coder.git import branches, commits, workdir
from coder.git.repository import Repo
from coder.tools import feedback
from coder.tools.base import Tool, ToolContext, ToolResult, params, prop
from coder.tools.proposal import FileChange, Proposal
from coder.tools.worktree import closest_match, numbered, real_root, resolve

DIFF_CAP = 30_000  # chars of git_diff output


class StatusArgs(TypedDict):
    pass


class DiffArgs(TypedDict, total=False):
    path: str
    staged: bool


class LogArgs(TypedDict, total=False):
    limit: int


class PatchArgs(TypedDict, total=False):
    patch: Required[str]
    dry_run: bool


def _repo(ctx: ToolContext) -> Repo:
    return workdir.open_files(real_root(ctx))


# --------------------------------------------------------------------------- git_status


def git_status(ctx: ToolContext, args: StatusArgs) -> ToolResult:
    repo = _repo(ctx)
    status = workdir.porcelain_status(repo)
    head = branches.head_commit(repo)
    where = "HEAD (no commits yet)" if head is None else f"HEAD {head[:7]}"
    if not status:
        return ToolResult(True, f"no changes against {where}", data={"changed": []})
    lines = [f"{code} {p}" for p, code in sorted(status.items())]
    return ToolResult(
        True,
        f"changes against {where} (?? = new file):\n" + "\n".join(lines),
        data={"changed": sorted(status)},
    )


# --------------------------------------------------------------------------- git_diff


def git_diff(ctx: ToolContext, args: DiffArgs) -> ToolResult:
    repo = _repo(ctx)
    only = None
    if args.get("path"):
        _, only = resolve(ctx, args["path"], write=False)
    patches = []
    for patch in workdir.head_patches(repo, staged=bool(args.get("staged"))):
        path = patch.path
        if only not in (None, ".") and path != only and not path.startswith(only + "/"):
            continue
        patches.append(patch)
    what = "staged changes" if args.get("staged") else "changes"
    if not patches:
        return ToolResult(
            True,
            f"no {what}" + (f" in {only}" if only else "") + " against HEAD",
            data={"files": []},
        )
    stats = []
    for p in patches:
        code = {"?": "A", "U": "A"}.get(p.status, p.status)
        stats.append(f"{code} {p.new_path} (+{p.added} -{p.removed})")
    text = "".join(p.text for p in patches)
    if len(text) > DIFF_CAP:
        cut = text.rfind("\n", 0, DIFF_CAP) + 1 or DIFF_CAP
        text = (
            text[:cut] + f"[diff cut at {DIFF_CAP} chars of {len(text)}; call git_diff "
            "with path=<file> to see one file]\n"
        )
    head = f"{len(patches)} file(s) with {what}: " + ", ".join(stats)
    return ToolResult(
        True,
        f"{head}\n{text}".rstrip("\n"),
        data={"files": [p.new_path for p in patches]},
    )


# --------------------------------------------------------------------------- git_log


def git_log(ctx: ToolContext, args: LogArgs) -> ToolResult:
    repo = _repo(ctx)
    limit = min(max(1, int(args.get("limit", 10))), 100)
    found = commits.log(repo, limit)
    if not found:
        return ToolResult(True, "no commits yet", data={"commits": []})
    lines = [f"{c.commit[:7]} {c.when:%Y-%m-%d} {c.subject}" for c in found]
    ids = [c.commit for c in found]
    return ToolResult(True, "\n".join(lines), data={"commits": ids})


# --------------------------------------------------------------------------- patches


@dataclass
class _Hunk:
    old_start: int | None  # None: a bare `@@` header (the position is found from the text)
    tail: str  # text after the closing @@ (a function name, usually)
    lines: list[str] = field(default_factory=list)  # ' x', '-x', '+x', '\\ No newline...'

    def side(self, marks: str) -> list[str]:
        return [ln[1:] for ln in self.lines if ln[:1] in marks]

    def header(self) -> str:
        return f"@@ -{self.old_start or '?'},{len(self.side(' -'))} @@"


@dataclass
class _FilePatch:
    old: str | None = None  # None: /dev/null (a new file)
    new: str | None = None  # None: /dev/null (a deleted file)
    hunks: list[_Hunk] = field(default_factory=list)
    binary: bool = False
    has_paths: bool = False

    @property
    def path(self) -> str:
        return self.new or self.old or "?"


_HUNK_HEADER = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@ ?(.*)")


def _strip_path(raw: str, prefix: str) -> str | None:
    path = raw.split("\t", 1)[0].strip()  # `--- a/x.py\t2024-01-01 ...` (diff -u timestamps)
    if len(path) > 1 and path[0] == path[-1] == '"':
        path = path[1:-1]
    if path == "/dev/null":
        return None
    return path[len(prefix) :] if path.startswith(prefix) else path


def _file_header_at(lines: list[str], i: int) -> bool:
    return (
        i + 1 < len(lines)
        and lines[i].startswith("--- ")
        and lines[i + 1].startswith("+++ ")
        and (
            lines[i].startswith(("--- a/", "--- /dev/null"))
            or lines[i + 1].startswith(("+++ b/", "+++ /dev/null"))
        )
    )


def _more_hunk_lines(lines: list[str], i: int) -> bool:
    """Whether hunk lines follow the blank line(s) at `i` (so they are context, not the end)."""
    j = i
    while j < len(lines) and lines[j] == "":
        j += 1
    return j < len(lines) and lines[j][:1] in (" ", "-", "+") and not _file_header_at(lines, j)


def parse_patch(text: str) -> list[_FilePatch]:
    text = text.replace("\r\n", "\n")
    lines = [ln for ln in text.split("\n") if not ln.startswith("```")]  # markdown fences
    files: list[_FilePatch] = []
    cur: _FilePatch | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            cur = _FilePatch()
            files.append(cur)
            m = re.match(r"diff --git a/(.+) b/(.+)$", line)
            if m:
                cur.old, cur.new = m.group(1), m.group(2)
            i += 1
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            if cur is None or cur.has_paths or cur.hunks:  # a section without `diff --git`
                cur = _FilePatch()
                files.append(cur)
            cur.old, cur.new = _strip_path(line[4:], "a/"), _strip_path(lines[i + 1][4:], "b/")
            cur.has_paths = True
            i += 2
        elif line.startswith("@@"):
            m = _HUNK_HEADER.match(line)
            bare = line.strip() in ("@@", "@@ @@")
            if cur is None or not cur.has_paths or not (m or bare):
                raise PatchProblem(
                    f"patch line {i + 1}: {'bad hunk header' if not m else 'hunk before --- / +++'}"
                    f" {line[:80]!r}",
                    hint="each file needs `--- a/PATH` and `+++ b/PATH` lines, then hunks starting "
                    "with `@@ -OLD,COUNT +NEW,COUNT @@`",
                )
            hunk = _Hunk(old_start=int(m.group(1)) if m else None, tail=m.group(5) if m else "")
            i += 1
            while i < len(lines):
                ln = lines[i]
                if ln.startswith(("diff --git ", "@@")) or _file_header_at(lines, i):
                    break
                if ln.startswith("\\"):
                    hunk.lines.append(ln)
                elif ln == "" and _more_hunk_lines(lines, i):
                    hunk.lines.append(" ")  # a blank context line whose space was stripped
                elif ln[:1] in (" ", "-", "+"):
                    hunk.lines.append(ln)
                else:
                    break
                i += 1
            cur.hunks.append(hunk)
        else:
            if cur is not None and ("GIT binary patch" in line or line.startswith("Binary files")):
                cur.binary = True
            i += 1
    if not files:
        raise PatchProblem(
            "no file changes found in the patch",
            hint="send a unified diff: `--- a/PATH`, `+++ b/PATH`, then @@ hunks",
        )
    return files


def _file_lines(data: str) -> list[str]:
    lines = data.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _place_hunks(fp: _FilePatch, current: list[str]) -> list[tuple[int, _Hunk]]:
    """(0-based start in the current file, hunk) for each hunk, or PatchProblem."""
    placed, floor = [], 0
    for number, hunk in enumerate(fp.hunks, 1):
        old = hunk.side(" -")
        if not old:  # pure insertion: after line old_start
            if hunk.old_start is None:
                raise PatchProblem(
                    f"hunk {number} for {fp.path} has no context lines and no line number",
                    hint="add a few unchanged lines around the change",
                )
            start = min(max(hunk.old_start, floor), len(current))
        else:
            hits = [
                s
                for s in range(floor, len(current) - len(old) + 1)
                if current[s] == old[0] and current[s : s + len(old)] == old
            ]
            if not hits:
                raise _hunk_problem(fp, number, hunk, old, current)
            if hunk.old_start is None and len(hits) > 1:
                raise PatchProblem(
                    f"hunk {number} for {fp.path} matches at lines "
                    f"{', '.join(str(h + 1) for h in hits[:10])}",
                    hint="give the hunk a line number (@@ -LINE,COUNT +LINE,COUNT @@) or more "
                    "context lines",
                )
            want = max((hunk.old_start or 1) - 1, 0)
            start = min(hits, key=lambda s: (abs(s - want), s))  # like patch's offset search
        placed.append((start, hunk))
        floor = start + len(old)
    return placed


def _hunk_problem(
    fp: _FilePatch, number: int, hunk: _Hunk, old: list[str], current: list[str]
) -> PatchProblem:
    shown = "\n".join(old[:30])
    msg = (
        f"hunk {number} of {len(fp.hunks)} for {fp.path} ({hunk.header()}) does not match the "
        f"file. Its context and '-' lines are:\n{shown}\n"
    )
    stripped, file_stripped = [o.strip() for o in old], [c.strip() for c in current]
    near = next(
        (
            s
            for s in range(len(current) - len(old) + 1)
            if file_stripped[s : s + len(old)] == stripped
        ),
        None,
    )
    best = closest_match(current, old)
    if near is not None:
        msg += f"Lines {near + 1}-{near + len(old)} match them except for whitespace:\n" + numbered(
            current[near : near + len(old)], near + 1
        )
    elif best is not None:
        s, e, ratio = best
        msg += f"Closest text in the file, lines {s + 1}-{e} ({ratio:.0%} similar):\n"
        msg += numbered(current[s:e], s + 1)
    else:
        msg += f"{fp.path} is empty."
    return PatchProblem(
        msg,
        hint="context and '-' lines must match the current file exactly "
        "(whitespace included). Re-read the file with fs_read and make "
        "the patch again, or use fs_edit for a small change",
    )


def _mark_missing_newline(hunk: _Hunk) -> None:
    """`hunk` reaches the end of a file whose last line has no line end: where the model left
    out git's "\\ No newline at end of file" (models do), put it after the old side's last
    line and the new side's, so the patch applies and the file still ends without one."""
    lines = hunk.lines
    if not any(ln[:1] in " -" for ln in lines) or any(ln.startswith("\\") for ln in lines):
        return
    ends = {
        max(i for i, ln in enumerate(lines) if ln[:1] in side)
        for side in (" -", " +")
        if any(ln[:1] in side for ln in lines)
    }
    hunk.lines = [
        marked
        for i, ln in enumerate(lines)
        for marked in ([ln, "\\ No newline at end of file"] if i in ends else [ln])
    ]


def _render(fp: _FilePatch, placed: list[tuple[int, _Hunk]], crlf: bool, mode: int) -> str:
    old_name, new_name = fp.old or fp.new, fp.new or fp.old
    out = [f"diff --git a/{old_name} b/{new_name}"]
    if fp.old is None:
        out.append("new file mode 100644")
    elif fp.new is None:
        out.append(f"deleted file mode {mode:o}")
    out.append(f"--- a/{fp.old}" if fp.old else "--- /dev/null")
    out.append(f"+++ b/{fp.new}" if fp.new else "+++ /dev/null")
    delta = 0
    for start, hunk in placed:
        n_old, n_new = len(hunk.side(" -")), len(hunk.side(" +"))
        old_hdr = start + 1 if n_old else start
        new_hdr = start + delta + (1 if n_new else 0)
        out.append(
            f"@@ -{old_hdr},{n_old} +{new_hdr},{n_new} @@" + (f" {hunk.tail}" if hunk.tail else "")
        )
        cr = "\r" if crlf else ""
        for line, after in zip(hunk.lines, [*hunk.lines[1:], ""]):
            # a line followed by git's "\ No newline at end of file" has no line end to keep
            out.append(line if line.startswith("\\") or after.startswith("\\") else line + cr)
        delta += n_new - n_old
    return "\n".join(out) + "\n"


def _prepare(ctx: ToolContext, files: list[_FilePatch]) -> tuple[str, list[str], list[str]]:
    """Check every file section; return (patch text for libgit2, change lines, paths)."""
    seen: set[str] = set()
    texts, summary, paths = [], [], []
    for fp in files:
        if fp.binary:
            raise PatchProblem(f"{fp.path}: binary patches are not supported")
        if not fp.has_paths and not fp.hunks:
            raise PatchProblem(f"{fp.path}: the section has no `---`/`+++` lines and no hunks")
        if fp.old is None and fp.new is None:
            raise PatchProblem("a file section has /dev/null on both sides")
        if fp.old and fp.new and fp.old != fp.new:
            raise PatchProblem(
                f"renaming {fp.old} to {fp.new} is not supported",
                hint="delete the old file (a section with `+++ /dev/null`) and create the new one",
            )
        for path in {p for p in (fp.old, fp.new) if p}:
            resolve(ctx, path, write=True)  # raises PolicyViolation: before anything is written
        real, rel = resolve(ctx, fp.path, write=True)
        if fp.new is None and os.path.islink(os.path.join(real_root(ctx), fp.path)):
            raise PatchProblem(f"{fp.path} is a symbolic link; a patch cannot delete it")
        # Patch the file the path really names (a symlink inside the worktree is followed).
        fp.old, fp.new = (rel if fp.old else None), (rel if fp.new else None)
        if rel in seen:
            raise PatchProblem(
                f"the patch changes {rel} in two sections",
                hint="put all hunks of one file in one section",
            )
        seen.add(rel)
        if not fp.hunks and fp.old is not None:
            raise PatchProblem(f"no hunks for {rel}")
        mode, crlf, current, data = 0o100644, False, [], ""
        if fp.old is None:
            if os.path.lexists(real):
                raise PatchProblem(
                    f"{rel} already exists, but the patch creates it",
                    hint="make the patch against the existing file, or use fs_edit",
                )
        else:
            if not real.is_file():
                raise PatchProblem(
                    f"{rel} does not exist (or is not a file)",
                    hint="for a new file use `--- /dev/null`, or use fs_write",
                )
            data = real.read_bytes().decode("utf-8", errors="surrogateescape")
            crlf = "\r\n" in data and data.count("\r\n") == data.count("\n")
            current = _file_lines(data.replace("\r\n", "\n") if crlf else data)
            mode = 0o100755 if os.access(real, os.X_OK) else 0o100644
        placed = _place_hunks(fp, current) if fp.old is not None else [(0, h) for h in fp.hunks]
        if fp.old is not None and data and not data.endswith("\n"):
            for start, hunk in placed:
                if start + len(hunk.side(" -")) == len(current):
                    _mark_missing_newline(hunk)
        texts.append(_render(fp, placed, crlf, mode))
        added = sum(len(h.side("+")) for h in fp.hunks)
        removed = sum(len(h.side("-")) for h in fp.hunks)
        code = "A" if fp.old is None else "D" if fp.new is None else "M"
        summary.append(f"{code} {rel} (+{added} -{removed})")
        paths.append(rel)
    return "".join(texts), summary, paths


def fs_apply_patch(ctx: ToolContext, args: PatchArgs) -> ToolResult:
    files = parse_patch(args["patch"])
    text, summary, paths = _prepare(ctx, files)
    repo = _repo(ctx)
    workdir.check_patch(repo, text)
    if args.get("dry_run"):
        return ToolResult(
            True,
            "the patch applies cleanly; it would change: "
            + ", ".join(summary)
            + " (nothing was written)",
            data={"would_change": paths},
        )
    root = real_root(ctx)
    before = {p: _snapshot(os.path.join(root, p)) for p in paths}
    lint = feedback.Lint(ctx)
    lint.before(p for p in paths if before[p] is not None)
    try:
        # libgit2 writes the files: confined like the commands, so a directory swapped for a
        # link by a process the model left running makes the write fail, not land outside
        workdir.apply_patch(repo, text, Path(root))
    except PatchProblem:
        for rel, old in before.items():  # all or nothing
            _restore(root, rel, old)
        raise
    for path in paths:
        after = _snapshot(os.path.join(root, path))
        refused = None if after is None else feedback.veto(ctx, path, _data(before[path]), after[0])
        if refused is not None:  # all or nothing: every file back as it was
            for rel, old in before.items():
                _restore(root, rel, old)
            return refused
    notes = lint.after(p for p in paths if os.path.lexists(os.path.join(root, p)))
    return ToolResult(
        True,
        "applied: " + ", ".join(summary) + (f"\n{notes}" if notes else ""),
        data={"files_changed": paths},
    )


def preview_patch(ctx: ToolContext, args: PatchArgs) -> Proposal | ToolResult | None:
    """fs_apply_patch's change, worked out without writing (None: a dry run writes nothing)."""
    if args.get("dry_run"):
        return None
    text, _, paths = _prepare(ctx, parse_patch(args["patch"]))
    workdir.check_patch(_repo(ctx), text)
    root = real_root(ctx)
    before = {p: _snapshot(os.path.join(root, p)) for p in paths}
    after = workdir.patched(text, before)
    changes = []
    for path in paths:
        old, new = before[path], after[path]
        refused = None if new is None else feedback.veto(ctx, path, _data(old), new)
        if refused is not None:
            return refused
        changes.append(FileChange(path, _data(old), new, 0o644 if old is None else old[1]))
    return Proposal("fs_apply_patch", tuple(changes), arguments=args)


def _snapshot(path: str) -> tuple[bytes, int] | None:
    """A file's content and mode (None: no such file)."""
    try:
        with open(path, "rb") as f:
            return f.read(), os.fstat(f.fileno()).st_mode & 0o7777
    except (FileNotFoundError, IsADirectoryError):
        return None


def _data(snapshot: tuple[bytes, int] | None) -> bytes | None:
    return None if snapshot is None else snapshot[0]


def _restore(root: str, rel: str, snapshot: tuple[bytes, int] | None) -> None:
    """`rel` back as `_snapshot` found it, never through a link (`coder.files.nofollow`)."""
    if snapshot is None:
        nofollow.remove(root, rel, prune=False)
    else:
        nofollow.write_file(root, rel, snapshot[0], mode=snapshot[1], exact_mode=True)


# --------------------------------------------------------------------------- definitions

GIT_STATUS = Tool(
    name="git_status",
    description="List the files changed since the last commit (M modified, A added, D deleted, "
    "?? new file).",
    parameters=params({}),
    handler=git_status,
    read_only=True,
)
GIT_DIFF = Tool(
    name="git_diff",
    description=(
        f"Show the uncommitted changes as a unified diff, new files included (cut at "
        f"{DIFF_CAP} characters; pass path to see one file or directory)."
    ),
    parameters=params(
        {
            "path": prop("string", "Only this file or directory (optional)."),
            "staged": prop("boolean", "Only changes staged in the git index (default false)."),
        }
    ),
    handler=git_diff,
    read_only=True,
)
GIT_LOG = Tool(
    name="git_log",
    description="Show recent commits, newest first: short id, date and subject.",
    parameters=params(
        {
            "limit": prop("integer", "Number of commits (default 10, at most 100)."),
        }
    ),
    handler=git_log,
    read_only=True,
)
FS_APPLY_PATCH = Tool(
    name="fs_apply_patch",
    description=(
        "Apply a unified diff (--- a/PATH, +++ b/PATH, @@ hunks) to one or more files; "
        "all or nothing. Use /dev/null to create or delete a file; dry_run=true only "
        "checks it."
    ),
    parameters=params(
        {
            "patch": prop("string", "The unified diff text."),
            "dry_run": prop(
                "boolean",
                "Check that it applies and report what would change, "
                "without writing (default false).",
            ),
        },
        required=["patch"],
    ),
    handler=fs_apply_patch,
    read_only=False,
    preview=preview_patch,
)
