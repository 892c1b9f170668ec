"""The worktree as every tool sees it: a model's path resolved inside it (and checked against
the step's write filter), writes that follow no link, globs over its paths, and its lines as
the model is shown them (numbered, and the window closest to a search that missed)."""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

from coder.errors import LinkInTheWay, PolicyViolation
from coder.files import nofollow
from coder.policy.paths import resolve_in_root
from coder.tools.base import ToolContext


def real_root(ctx: ToolContext) -> str:
    return os.path.realpath(ctx.root)


def resolve(ctx: ToolContext, path: str, *, write: bool) -> tuple[Path, str]:
    """The real path of a model-supplied path and its repo-relative posix form. Writes are also
    checked against `ctx.write_filter`, on both the name given and the resolved target."""
    real = resolve_in_root(ctx.root, path, write=write, policy=ctx.policy)
    root = real_root(ctx)
    rel = Path(os.path.relpath(real, root)).as_posix()
    if write and ctx.write_filter is not None:
        lexical = os.path.normpath(os.path.join(root, path))
        names = {rel, Path(os.path.relpath(lexical, root)).as_posix()}
        for name in sorted(names):
            reason = ctx.write_filter(name)
            if reason:
                raise PolicyViolation(
                    f"refusing to write {path}: {reason}",
                    hint="choose a file this step is allowed to change",
                )
    return real, rel


def write_in_root(
    ctx: ToolContext, rel: str, data: bytes, *, mode: int, new_only: bool = False
) -> None:
    """Write `rel` (resolved: inside the worktree, no link on its way when it was checked)
    without following a link: a process the model left running may swap a directory for a
    link between the check and the write, and the write then fails instead of landing
    outside (`coder.files.nofollow`)."""
    try:
        nofollow.write_file(
            real_root(ctx), rel, data, mode=mode, exact_mode=True, new_only=new_only
        )
    except LinkInTheWay as exc:
        raise PolicyViolation(
            f"refusing to write {rel}: {exc.rel} became a symbolic link while it was written",
            hint="a process left running changes the worktree; end it, then try again",
        ) from None


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob as a regex over repo-relative posix paths: `*` and `?` stay within one path
    part, `**` spans parts, `[...]` and `{a,b}` work. A pattern without `/` matches the file
    name at any depth (`*.py`)."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[" and (j := pattern.find("]", i + 2)) > 0:
            body = pattern[i + 1 : j]
            body = "^" + body[1:] if body.startswith("!") else body
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = j + 1
        elif c == "{" and (j := pattern.find("}", i)) > 0 and "," in pattern[i:j]:
            out.append("(?:" + "|".join(re.escape(a) for a in pattern[i + 1 : j].split(",")) + ")")
            i = j + 1
        else:
            out.append(re.escape(c))
            i += 1
    body = "".join(out)
    return re.compile(body if "/" in pattern else f"(?:.*/)?{body}")


def normalize_glob(ctx: ToolContext, pattern: str) -> str:
    root = real_root(ctx)
    pattern = pattern.strip()
    if pattern.startswith(root.rstrip("/") + "/"):
        pattern = pattern[len(root.rstrip("/")) + 1 :]
    if pattern.startswith("/") or pattern.startswith("../") or "/../" in pattern:
        raise PolicyViolation(
            f"glob {pattern!r} leaves the repository",
            hint="patterns are relative to the repository root, e.g. src/**/*.py",
        )
    pattern = pattern.removeprefix("./")
    if pattern in ("", "."):
        return "**"
    if pattern.endswith("/") or (
        not re.search(r"[*?\[{]", pattern) and os.path.isdir(os.path.join(root, pattern))
    ):
        return pattern.rstrip("/") + "/**"  # a directory: everything below it
    return pattern


def numbered(lines: list[str], first: int, width: int = 5) -> str:
    """`   12| text` lines, as fs_read shows them."""
    return "\n".join(f"{n:>{width}}| {line}" for n, line in enumerate(lines, first))


def closest_match(lines: list[str], target: list[str]) -> tuple[int, int, float] | None:
    """(start, end, similarity) of the window of len(target) lines most like `target`
    (0-based, end exclusive). quick_ratio preselects, so a long file stays fast."""
    if not lines or not target:
        return None
    n = min(len(target), len(lines))
    want = "\n".join(target)
    matcher = difflib.SequenceMatcher(None, autojunk=False)
    matcher.set_seq2(want)
    scored = []
    for i in range(0, len(lines) - n + 1):
        matcher.set_seq1("\n".join(lines[i : i + n]))
        scored.append((matcher.quick_ratio(), i))
    best: tuple[int, int, float] | None = None
    for _, i in sorted(scored, key=lambda s: (-s[0], s[1]))[:8]:
        matcher.set_seq1("\n".join(lines[i : i + n]))
        ratio = matcher.ratio()
        if best is None or ratio > best[2]:
            best = (i, i + n, ratio)
    return best
